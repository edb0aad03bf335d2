"""tests/compat: torch.fx's real clients (torchvision, timm) run on fxloom; skipped, saying
so, where torchvision or timm is not installed (``pip install --no-deps torchvision timm``:
the test extras pin them)."""
