"""quant-lab's shared helpers: the notebooks call these, the tests check them.

- the machine: platform (which device), packages (versions), ceilings (measured TFLOP/s and GB/s),
  timing (the one timer), monitor (GPU sampling), gpu_cap (a per-kernel GPU memory cap)
- runs and reports: results (atomic results.json, JSONL), runs (run folders), reporting (the run
  report), plots, widgets (the labs' explorers), quiet (library start-up noise kept out of lessons)
- models: fetch (modelscope or the fixture), models (loading, the GPTQ kernel policy and its one list of
  kernels), model_check (a model folder against itself before it loads), gptq (the reference unpacker and
  packer), generation, fixture and gsm_synth (the embedded fixture)
- evaluation: evaluation (lm-eval's gsm8k), stats (paired tests), anchors (the report's absolute scores)
- divergence: metrics (similarity, the one error bound, the one healthy/degraded/critical rule), divergence (logit and KL checks), localize
  (layer by layer), capture (golden captures), lab_inputs (Lab 04's models and questions), sad_path
- kernels: kernels (the Triton package), numerics (ULPs, accumulators, FP8, MX), int8wo, roofline
- exercises: exercises (self-checks and grading), formulas (references the exercises need)
"""
__version__ = "0.1.0"
