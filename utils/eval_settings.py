"""The settings of one GSM8K evaluation, declared and checked in one place (like lm-eval's gsm8k.yaml).

A frozen dataclass: a lab builds it once from its parameters (`EvalSettings.from_params`), every check
runs then and names the lab's parameter, and data-parallel workers, served runs and benchmarks get
variants of it through `replace`, which checks again. `as_dict` is what results.json records.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class EvalInputError(ValueError):
    """A parameter of the evaluation is wrong; the message names it and says what to do."""


# lab parameter name -> field, where the lab's name says what it means to a student
ALIASES = {"gsm8k_limit": "limit", "shard": "parallelize"}
BACKENDS = ("hf", "vllm", "local-completions")
DECODES_HF_ONLY = "eager"        # every other decode mode drives the hf generate loop
DECODES = ("eager", "compiled")  # utils.decode.DECODES, without importing torch here
DTYPES = ("auto", "float32", "bfloat16", "float16")
ALIASES_BACK = {v: k for k, v in ALIASES.items()}


def _whole(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


@dataclass(frozen=True)
class EvalSettings:
    """How run_gsm8k evaluates a model. Field by field:

    backend: lm-eval model type: "hf" (transformers in this process), "vllm", or "local-completions" (a server).
    device: where the hf model runs ("cpu", "cuda", "cuda:0").
    batch_size: problems generated together: a whole number >= 1, or "auto" / "auto:N" (lm-eval probes).
    max_batch_size: the most "auto" may choose (None: no bound).
    num_fewshot: solved train examples put before each question (the published GSM8K number uses 5).
    apply_chat_template / fewshot_as_multiturn: lm-eval's chat-model prompt options (off: the plain prompt).
    limit: only the first N test problems (None: all of them); the lab's parameter gsm8k_limit.
    seed: lm-eval's python, numpy, torch and few-shot seeds.
    max_gen_toks: the most tokens generated per answer (stop sequences usually end it earlier).
    max_length: prompt + generated tokens at most (None: the model's maximum).
    dtype: weight dtype, or "auto" (utils.models.default_dtype, as Labs 02-04 use).
    parallelize: split one model over all visible GPUs (the lab's parameter shard).
    tensor_parallel_size / data_parallel_size: vllm's own parallelism.
    gptq_backend: the GPTQModel kernel of a GPTQ checkpoint (ignored for an unquantized one).
    decode: how the hf generate loop runs (utils.decode: "eager", or "compiled" on a GPU).
    param: the lab parameter that named the model, so a load failure says which one to fix.
    """

    backend: str = "hf"
    device: str = "cpu"
    batch_size: int | str = "auto"
    max_batch_size: int | None = 64
    num_fewshot: int = 5
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = False
    limit: int | None = None
    seed: int = 1234
    max_gen_toks: int = 256
    max_length: int | None = None
    dtype: str = "auto"
    parallelize: bool = False
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gptq_backend: str = "auto"
    decode: str = "eager"
    param: str = "model"

    def __post_init__(self) -> None:
        if self.limit is not None and (not _whole(self.limit) or self.limit < 1):
            raise EvalInputError(f"gsm8k_limit: {self.limit!r} must be a positive whole number of problems, or None")
        if not _whole(self.num_fewshot) or self.num_fewshot < 0:
            raise EvalInputError(f"num_fewshot: {self.num_fewshot!r} must be a whole number >= 0")
        if not _whole(self.max_gen_toks) or self.max_gen_toks < 1:
            raise EvalInputError(f"max_gen_toks: {self.max_gen_toks!r} must be a whole number >= 1")
        if self.max_length is not None and (not _whole(self.max_length) or self.max_length <= self.max_gen_toks):
            raise EvalInputError(f"max_length: {self.max_length!r} must be a whole number of tokens above max_gen_toks "
                                 f"({self.max_gen_toks}): the prompt and the generation share it; None means the model's")
        if not _batch_ok(self.batch_size):
            raise EvalInputError(f"batch_size: {self.batch_size!r} must be a whole number >= 1, 'auto' or 'auto:N'")
        if self.max_batch_size is not None and (not _whole(self.max_batch_size) or self.max_batch_size < 1):
            raise EvalInputError(f"max_batch_size: {self.max_batch_size!r} must be a whole number >= 1, or None")
        if not _whole(self.seed):
            raise EvalInputError(f"seed: {self.seed!r} must be a whole number")
        for name in ("tensor_parallel_size", "data_parallel_size"):
            if not _whole(getattr(self, name)) or getattr(self, name) < 1:
                raise EvalInputError(f"{name}: {getattr(self, name)!r} must be a whole number >= 1")
        if self.backend not in BACKENDS:
            raise EvalInputError(f"backend: {self.backend!r} is not supported; use one of {list(BACKENDS[:2])} "
                                 "(or an endpoint, which utils.eval_endpoint runs as local-completions)")
        for name in ("apply_chat_template", "fewshot_as_multiturn", "parallelize"):
            if not isinstance(getattr(self, name), bool):   # "False" as text is truthy: a silent switch-on
                raise EvalInputError(f"{ALIASES_BACK.get(name, name)}: {getattr(self, name)!r} must be True or False")
        if self.fewshot_as_multiturn and not self.apply_chat_template:
            raise EvalInputError("fewshot_as_multiturn: True puts the few-shot examples in chat turns and needs "
                                 "apply_chat_template = True; set both, or neither")
        if self.dtype not in DTYPES:
            raise EvalInputError(f"dtype: {self.dtype!r} is not one of {list(DTYPES)} (auto: the course's choice "
                                 "per device and checkpoint)")
        if self.decode not in DECODES:
            raise EvalInputError(f"decode: {self.decode!r} is not one of {list(DECODES)}")
        if not isinstance(self.device, str) or not self.device.strip():
            raise EvalInputError(f"device: {self.device!r} must name a device, e.g. 'cpu' or 'cuda'")
        if self.backend != "hf" and self.decode != DECODES_HF_ONLY:
            raise EvalInputError(f"decode: {self.decode!r} applies to the hf backend only; backend "
                                 f"{self.backend!r} runs its own loop")

    @classmethod
    def from_params(cls, **params: Any) -> "EvalSettings":
        """From a lab's parameters (gsm8k_limit and shard under their lab names); an unknown one is refused."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in params.items():
            name = ALIASES.get(key, key)
            if name not in fields:
                raise EvalInputError(f"{key}: not a setting of the GSM8K evaluation; known: "
                                     f"{sorted(fields | set(ALIASES))}")
            kwargs[name] = value
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "EvalSettings":
        """A variant (checked again), e.g. a worker's device or a comparison's batch size."""
        return EvalSettings.from_params(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _batch_ok(value: Any) -> bool:
    if _whole(value):
        return value >= 1
    if isinstance(value, str) and value.startswith("auto"):
        rest = value[len("auto"):]
        return rest == "" or (rest.startswith(":") and rest[1:].isdigit() and int(rest[1:]) >= 1)
    return False
