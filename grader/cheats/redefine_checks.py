# attack: define the test cell's own helper names in the answer cell, hoping the tests use these instead
# defended-by: split
def assert_close(*args, **kwargs):
    return None


def assert_equal(*args, **kwargs):
    return None


def check_ring(*args, **kwargs):
    return None
