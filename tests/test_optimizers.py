"""models/optimizers.py Lamb against `keras.optimizers.Lamb` (Keras 3.15) and against BERT's
LAMB written out in numpy: the same Adam-with-trust-ratio core, two differences that BERT's
recipe depends on (why the project keeps its own), and the config round trip. The rate groups
of both optimizers: a factor per variable, and moments that began at a later update.
"""

from __future__ import annotations

import keras
import numpy as np

from models.optimizers import AdamW, Lamb

LR, BETA_1, BETA_2, EPSILON = 0.01, 0.9, 0.999, 1e-6


def variables():
    rng = np.random.default_rng(0)
    return {"kernel": rng.normal(size=(3, 4)).astype("float32"),
            "bias": np.array([0.1, 0.2, -0.3, 0.4], "float32")}


def gradients(steps=4):
    rng = np.random.default_rng(1)
    return [{"kernel": rng.normal(size=(3, 4)).astype("float32"),
             "bias": rng.normal(size=(4,)).astype("float32")} for _ in range(steps)]


def run(optimizer, exclude=False):
    """`optimizer` on the two variables for every step of `gradients()`; the final values."""
    start = variables()
    weights = [keras.Variable(start[name], name=name) for name in ("kernel", "bias")]
    if exclude:
        optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build(weights)
    for grads in gradients():
        optimizer.apply([grads["kernel"], grads["bias"]], weights)
    return {w.name: keras.ops.convert_to_numpy(w) for w in weights}


def reference(weight_decay, excluded=(), keras_style=False):
    """LAMB in numpy. BERT's (Google's optimization.py, NVIDIA's): the decay is added to the
    Adam update before the trust ratio, and excluded variables get neither decay nor ratio.
    `keras_style`: Keras 3.15's `Lamb`: decoupled decay `w -= lr·wd·w` first (not for excluded
    variables), then the Adam update times the trust ratio, for every variable."""
    values = {k: v.astype("float64") for k, v in variables().items()}
    m = {k: np.zeros_like(v) for k, v in values.items()}
    v = {k: np.zeros_like(x) for k, x in values.items()}
    for t, grads in enumerate(gradients(), start=1):
        for name, w in values.items():
            g = grads[name].astype("float64")
            decays = name not in excluded
            if keras_style and decays and weight_decay:
                w = w - LR * weight_decay * w
            m[name] = BETA_1 * m[name] + (1 - BETA_1) * g
            v[name] = BETA_2 * v[name] + (1 - BETA_2) * g * g
            update = (m[name] / (1 - BETA_1 ** t)) / (np.sqrt(v[name] / (1 - BETA_2 ** t))
                                                       + EPSILON)
            if not keras_style and decays:
                update = update + weight_decay * w
            ratio = 1.0
            if keras_style or decays:
                w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            values[name] = w - LR * ratio * update
    return values


def ours(weight_decay, exclude=False):
    return run(Lamb(LR, BETA_1, BETA_2, EPSILON, weight_decay=weight_decay), exclude)


def keras_lamb(weight_decay, exclude=False):
    return run(keras.optimizers.Lamb(LR, BETA_1, BETA_2, EPSILON,
                                     weight_decay=weight_decay or None), exclude)


def close(a: dict, b: dict, atol=2e-6) -> bool:
    return all(np.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def test_without_decay_or_exclusions_ours_is_keras_lamb():
    a, b = ours(0.0), keras_lamb(0.0)
    assert close(a, b)
    assert close(a, reference(0.0))
    assert not close(a, {k: w for k, w in variables().items()})  # it moved


def test_excluded_variables_get_no_trust_ratio_in_ours_and_one_in_keras():
    """BERT excludes LayerNorm parameters and biases from decay AND from the layer-wise
    adaptation; Keras' Lamb still scales their step by ‖w‖ / ‖update‖."""
    a, b = ours(0.0, exclude=True), keras_lamb(0.0, exclude=True)
    np.testing.assert_allclose(a["kernel"], b["kernel"], atol=2e-6)  # not excluded: same
    assert close(a, reference(0.0, excluded={"bias"}))
    assert close(b, reference(0.0, excluded={"bias"}, keras_style=True))
    difference = np.abs(a["bias"] - b["bias"]).max()
    assert difference > 1e-3, difference  # far beyond float rounding


def test_weight_decay_goes_inside_the_trust_ratio_in_ours_and_outside_in_keras():
    a, b = ours(0.1, exclude=True), keras_lamb(0.1, exclude=True)
    assert close(a, reference(0.1, excluded={"bias"}))
    assert close(b, reference(0.1, excluded={"bias"}, keras_style=True))
    difference = np.abs(a["kernel"] - b["kernel"]).max()
    assert difference > 1e-4, difference


def test_config_round_trip_keeps_the_decay_rate_and_no_decoupled_decay():
    optimizer = Lamb(learning_rate=0.002, weight_decay=0.05, epsilon=1e-6)
    config = optimizer.get_config()
    assert config["weight_decay"] == 0.05
    again = Lamb.from_config(config)
    assert again.weight_decay_rate == 0.05
    assert again.weight_decay is None  # Keras' own decoupled decay stays off
    assert close(run(again), run(Lamb.from_config(config)))


def test_rate_groups_scale_the_update_and_restart_the_moments_of_late_variables():
    """A variable frozen for 50 updates then trained (moments_from=50) steps as a fresh
    AdamW/LAMB would; a factor scales the update (weight decay too); no groups: Keras' AdamW."""
    grads = gradients(6)
    for make in (lambda: AdamW(learning_rate=LR, weight_decay=0.01, epsilon=EPSILON),
                 lambda: Lamb(learning_rate=LR, weight_decay=0.01, epsilon=EPSILON)):
        adamw = isinstance(make(), AdamW)
        fresh = run(make())
        late = make()
        start = variables()
        kernel, bias = keras.Variable(start["kernel"]), keras.Variable(start["bias"])
        late.build([kernel, bias])
        late.iterations.assign(50)  # 50 updates of other variables before these unfroze
        late.set_rate_groups(moments_from=[(kernel, 50), (bias, 50)])
        for g in grads[:4]:
            late.apply([g["kernel"], g["bias"]], [kernel, bias])
        np.testing.assert_allclose(keras.ops.convert_to_numpy(kernel), fresh["kernel"],
                                   rtol=1e-5, atol=1e-7)
        if not adamw:  # LAMB's trust ratio rescales the update: the count matters little
            continue
        # Without the group, Keras' count of 54 updates would step otherwise.
        plain = make()
        kernel2 = keras.Variable(start["kernel"])
        plain.build([kernel2])
        plain.iterations.assign(50)
        for g in grads[:4]:
            plain.apply([g["kernel"]], [kernel2])
        assert not np.allclose(keras.ops.convert_to_numpy(kernel2), fresh["kernel"], rtol=1e-3)

    # A factor of 3 moves a variable 3 times as far on its first update, decay included.
    start = variables()
    one, three = keras.Variable(start["kernel"]), keras.Variable(start["kernel"])
    opt = AdamW(learning_rate=LR, weight_decay=0.01, epsilon=EPSILON)
    opt.build([one, three])
    opt.set_rate_groups(factors=[(three, 3.0)])
    opt.apply([grads[0]["kernel"]] * 2, [one, three])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(three) - start["kernel"],
                               3 * (keras.ops.convert_to_numpy(one) - start["kernel"]),
                               rtol=1e-4)
    # No groups: the same updates as Keras' own AdamW.
    ours = run(AdamW(learning_rate=LR, weight_decay=0.01, epsilon=EPSILON))
    keras_own = run(keras.optimizers.AdamW(learning_rate=LR, weight_decay=0.01, epsilon=EPSILON))
    for name in ours:
        np.testing.assert_allclose(ours[name], keras_own[name], rtol=1e-6, atol=1e-8)
