# attack: swallow every exception raised in later cells with IPython's custom exception handler
# defended-by: split
get_ipython().set_custom_exc((BaseException,), lambda shell, etype, value, tb, tb_offset=None: None)
