"""retrain's own callback: adaptive KL and the Ctrl-C flag (no training needed)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from collapse_doctor.retrain.callbacks import InterruptFlag, RetrainCallback


def test_adaptive_kl_moves_beta_toward_the_target() -> None:
    callback = RetrainCallback(interrupt=InterruptFlag(), kl_target=0.1)
    callback.trainer = SimpleNamespace(beta=0.04)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    callback.on_log(None, None, control, logs={"kl": 0.5})  # KL far above target: beta rises by 10%
    assert callback.trainer.beta == pytest.approx(0.044)
    callback.on_log(None, None, control, logs={"kl": 0.0})  # far below: falls by 10%
    assert callback.trainer.beta == pytest.approx(0.0396)
    callback.on_log(None, None, control, logs={"loss": 1.0})  # no KL logged: unchanged
    assert callback.trainer.beta == pytest.approx(0.0396)


def test_first_ctrl_c_asks_for_a_stop_the_second_aborts() -> None:
    flag = InterruptFlag()
    flag.install()
    try:
        signal.raise_signal(signal.SIGINT)
        assert flag.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        flag.restore()
    assert signal.getsignal(signal.SIGINT) != flag._handler


def test_an_interrupt_stops_at_the_end_of_the_step_with_a_checkpoint() -> None:
    flag = InterruptFlag()
    callback = RetrainCallback(interrupt=flag)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    state = SimpleNamespace(global_step=3)
    callback.on_step_begin(None, state, control)
    callback.on_step_end(None, state, control)
    assert not control.should_training_stop and callback.interrupted_at is None
    flag.requested = True
    callback.on_step_end(None, state, control)
    assert control.should_save and control.should_training_stop and callback.interrupted_at == 3
    assert len(callback.step_seconds) == 2
