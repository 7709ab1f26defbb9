# attack: edit the test cell into `pass` and mark it as an answer cell, so it runs as student code
# defended-by: split
# tamper: test_ring_all_reduce
