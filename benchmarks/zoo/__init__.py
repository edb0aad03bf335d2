"""A zoo of real models captured by fxloom, torch.fx and torch.export side by side.

``registry.py`` builds the models (Hugging Face architectures from tiny configs with random
weights, plus ``fxloom.zoo``), ``methods.py`` captures one with each method, ``worker.py``
measures one (model, method) pair and ``run.py`` runs every pair in a fresh subprocess and
writes ``results.json`` and ``RESULTS.md``::

    python -m benchmarks.zoo.run                       # everything (or: make zoo)
    python -m benchmarks.zoo.run --models bert vit --methods fxloom torch.fx
"""
