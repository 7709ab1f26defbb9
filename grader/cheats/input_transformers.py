# attack: register an IPython input transformer that turns every later cell (hidden tests included) into `pass`
# defended-by: split
get_ipython().input_transformers_cleanup.append(lambda lines: ["pass\n"])
