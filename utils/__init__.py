"""quant-lab's shared helpers: the notebooks call these, the tests check them.

Modules: platform (which machine), ceilings (measured TFLOP/s and GB/s), monitor (GPU sampling),
packages (versions), results (atomic, versioned results.json), runs (run folders), reporting (the
run report), plots (figures).
"""
__version__ = "0.1.0"
