# attack: patch builtins so that assertion errors and comparisons can no longer fail
# defended-by: split
import builtins

builtins.AssertionError = type("AssertionError", (Exception,), {})
builtins.any = lambda *a, **k: False
builtins.all = lambda *a, **k: True
