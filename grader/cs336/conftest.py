"""Without a GPU, CS336's Triton tests run on the CPU under Triton's interpreter: they are collected (their skip
marks read ``torch.cuda.is_available()`` when the module is imported), and the tensors they ask for on "cuda" are
made on the CPU. With a GPU this file changes nothing."""
import pytest
import torch

if not torch.cuda.is_available():
    _is_available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # only while the test module is collected

    def pytest_collection_finish(session):
        torch.cuda.is_available = _is_available

    @pytest.fixture(autouse=True)
    def _cuda_tensors_on_the_cpu(monkeypatch):
        randn = torch.randn
        monkeypatch.setattr(torch, "randn", lambda *a, device=None, **kw: randn(
            *a, device="cpu" if str(device).startswith("cuda") else device, **kw))
