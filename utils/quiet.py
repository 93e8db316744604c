"""Keep the libraries' start-up chatter out of a lesson's output.

Loading the course's models prints a page of messages that are harmless here and read like errors
to a student: torchao's "Failed to load ..._C_mxfp8.so" (its CUDA extensions, on a CPU box), torch's
pytree deprecation notes, GPTQModel's banner and INFO lines, transformers' notes on the GPTQ config,
lm-eval's INFO lines and its warnings about arguments the course passes on purpose.
quiet_libraries() silences exactly those: whole loggers only where everything below ERROR is such
noise (torchao, torch's pytree, GPTQModel; lm-eval's INFO), elsewhere the named messages. Other
warnings, and every error, still show. Call it before the libraries are imported (the labs' first
code cell does).
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings

# logger -> the level below which its records are all start-up notes in this course
LOGGER_LEVELS = {"torchao": logging.ERROR, "torch.utils._pytree": logging.ERROR, "gptqmodel": logging.ERROR,
                 "logbar": logging.ERROR, "lm_eval": logging.WARNING}
# logger -> messages (regex, matched at the start) it logs on every run of the course, on purpose
NOTED_MESSAGES = {
    "transformers.modeling_utils": (r"`loss_type=None` was set in the config but it is unrecognized",),
    "lm_eval.models.huggingface": (r"`pretrained` model kwarg is not of type `str`",
                                   r"Passed an already-initialized model through `pretrained`"),
    "lm_eval.evaluator": (r"generation_kwargs: .* specified through cli", r"Overwriting default num_fewshot"),
}
# (category, message regex, module regex) of warnings raised on every run: transformers' on each load of
# the GPTQ model, and torchao's source compiled by Python 3.12+ on a fresh install (an escape in a docstring)
NOTED_WARNINGS = ((UserWarning, r"You passed `quantization_config`", ""),
                  (FutureWarning, r"`is_gradient_checkpointing` is deprecated", ""),
                  (SyntaxWarning, r"invalid escape sequence", r".*torchao"))


class _DropMessages(logging.Filter):
    """Drops records whose message starts with one of the patterns (a logger's own records only)."""

    def __init__(self, patterns):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(p.match(msg) for p in self.patterns)


def quiet_libraries() -> dict:
    """Apply the module's silences (idempotent); returns what was silenced, for the curious."""
    for category, message, module in NOTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, level in LOGGER_LEVELS.items():
        logging.getLogger(name).setLevel(level)
    for name, patterns in NOTED_MESSAGES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(patterns))
    try:                                      # GPTQModel logs through LogBar's shared logger; importing
        with contextlib.redirect_stdout(io.StringIO()):   # logbar makes it, with a one-off INFO note
            from logbar import LogBar                     # ("headless/CI mode") printed before any
            LogBar.shared().setLevel(logging.ERROR)       # level can be set: swallowed here
    except ImportError:
        pass
    return {"loggers": {k: logging.getLevelName(v) for k, v in LOGGER_LEVELS.items()}, "messages": NOTED_MESSAGES,
            "warnings": [m for _, m, _ in NOTED_WARNINGS]}
