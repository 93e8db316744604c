"""Imported by Python at the start of every lab kernel the chain starts (ci/run.py puts this folder on
the kernels' PYTHONPATH): the GPU memory cap and the peak-memory record of utils/gpu_cap.py, only when
a profile's env asks for them ($QUANTLAB_GPU_MEMORY_GIB, $QUANTLAB_PEAKS_DIR) and only in a Jupyter kernel.
Any other sitecustomize further down sys.path still runs."""
import os
import sys

if (os.environ.get("QUANTLAB_GPU_MEMORY_GIB") or os.environ.get("QUANTLAB_PEAKS_DIR")) and any(
        "ipykernel" in a for a in getattr(sys, "orig_argv", sys.argv)[:4]):
    from utils.gpu_cap import kernel_hook

    kernel_hook()


def _chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_chain()
