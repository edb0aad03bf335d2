"""tests/compat: torch.fx's real clients (torchvision, timm) run on fxloom; skipped, saying
so, where torchvision or timm is not installed (`make setup` puts them in .venv/compat-packages:
pyproject.toml's compat extra pins them)."""
