"""fp16 mixed precision trains the digits CNN as well as fp32 (within one point)."""

from pathlib import Path

from pocket.formats.container import read_container


def test_fp16_digits_within_one_point_of_fp32(digits_ckpt, tmp_path):
    from pocket.train.run import train_from_config

    with read_container(digits_ckpt) as c:
        fp32_acc = c.graph.metadata["metrics"]["test_accuracy"]
        epochs = c.meta["config"]["train"]["epochs"]
    config = Path(__file__).parents[2] / "examples" / "digits_cnn.toml"
    r = train_from_config(str(config), {"out": str(tmp_path / "fp16"), "precision": "fp16",
                                        "epochs": epochs}, quiet=True)
    assert r["precision"] == "fp16"
    fp16_acc = r["test"]["accuracy"]
    assert fp16_acc >= fp32_acc - 0.01, (fp16_acc, fp32_acc)
    assert fp32_acc >= 0.97
    # The loss scaler ran: the scale is recorded every epoch, and few steps were skipped.
    assert r["final"]["loss_scale"] > 0
    assert r["final"]["skipped_steps"] <= 10
