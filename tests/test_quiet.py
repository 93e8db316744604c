"""utils.quiet silences the named start-up notes, and nothing else."""
import logging
import warnings

import pytest

from utils import quiet


@pytest.fixture
def restored_loggers():
    names = list(quiet.LOGGER_LEVELS) + list(quiet.NOTED_MESSAGES)
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names}
    yield
    for n, (level, filters) in saved.items():
        logging.getLogger(n).setLevel(level)
        logging.getLogger(n).filters[:] = filters


def test_named_messages_dropped_other_warnings_kept(caplog, restored_loggers):
    quiet.quiet_libraries()
    quiet.quiet_libraries()                                   # twice: still one filter per logger
    ev = logging.getLogger("lm_eval.evaluator")
    assert sum(isinstance(f, quiet._DropMessages) for f in ev.filters) == 1
    with caplog.at_level(logging.INFO):
        ev.warning("Overwriting default num_fewshot of %s from %s to %s", "gsm8k", 5, 5)
        ev.warning("Task gsm8k has no test split")            # not a noted message: must show
        ev.info("Setting random seed to 1234")                # lm-eval's INFO: below its level now
        logging.getLogger("torchao").warning("Failed to load _C_mxfp8.so")
        logging.getLogger("torchao").error("a real torchao error")
        logging.getLogger("transformers.modeling_utils").warning(
            "`loss_type=None` was set in the config but it is unrecognized. Using the default loss")
        logging.getLogger("transformers.modeling_utils").warning("Some weights were not initialized")
    shown = [r.getMessage() for r in caplog.records]
    assert shown == ["Task gsm8k has no test split", "a real torchao error", "Some weights were not initialized"]


def test_only_the_noted_warnings_are_ignored(restored_loggers):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet.quiet_libraries()                               # its filters go in front of "always"
        warnings.warn("You passed `quantization_config` or equivalent parameters", UserWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning)
        warnings.warn("fp16 overflowed to inf", UserWarning)
        for path in ("/site/torchao/quantization/quant_api.py", "/labs/my_kernel.py"):    # as the compiler does
            warnings.warn_explicit("invalid escape sequence '\\.'", SyntaxWarning, path, 1542)
    assert [str(w.message) for w in seen] == ["fp16 overflowed to inf", "invalid escape sequence '\\.'"]
    assert seen[-1].filename == "/labs/my_kernel.py"            # torchao's is silenced, a student's is not
