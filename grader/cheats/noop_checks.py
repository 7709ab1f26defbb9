# attack: replace the course's assertion helpers and torch's comparison functions with no-ops
# defended-by: split
# needs: torch and the course's check helpers, which Lab 01's tests call
import lab_utils.labkit.checks as _checks
import torch.testing

for _name in ("assert_close", "assert_equal", "assert_ranks_agree", "assert_state_close"):
    setattr(_checks, _name, lambda *a, **k: None)
torch.testing.assert_close = lambda *a, **k: None
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
