"""lazyframes.cleanrl.PrioritizedReplayBuffer against CleanRL's rules for its Rainbow buffer.

CleanRL's ``rainbow_atari.py`` keeps a deque of the last ``n_step`` adds; once full, it
stores the window's first transition with ``sum gamma**i r_i`` up to and including the
first ``done``, the observation after that step, and ``done`` if one occurred; a done
empties the deque. Priorities are ``(|td| + eps) ** alpha``, a new transition gets the
largest so far, weights ``(N P(i)) ** -beta`` over the batch's largest. ``cleanrl_windows``
restates those rules; the drop-in also keeps the tail windows CleanRL drops.
(tests/scripts/test_cleanrl_upstream.py runs CleanRL's own file against it, opt-in.)
"""

import numpy as np
import pytest
import torch
from conftest import refused

from lazyframes.cleanrl import PrioritizedReplayBuffer

SHAPE = (4, 8, 8)


def stack(t):
    """The observation at step ``t``: frames ``t-3 .. t`` filled with their step number."""
    return np.stack([np.full(SHAPE[1:], max(t - 3 + j, 0) % 256, np.uint8) for j in range(4)])


def episode_stream(steps, ends, truncs=()):
    """CleanRL's ``add`` arguments: step ``t`` is terminal when ``t in ends``."""
    for t in range(steps):
        yield (stack(t)[None], np.array([t % 5]), np.array([float(t % 7) - 2.0]),
               stack(t + 1)[None], np.array([t in ends]), np.array([t in truncs]))  # fmt: skip


def cleanrl_windows(steps, ends, n, gamma):
    """``{t: (reward, next_step, done)}`` of every window CleanRL's buffer stores."""
    out, window = {}, []
    for t in range(steps):
        window = [*window, t][-n:]
        if len(window) < n:
            continue  # (a done here does not empty the deque: CleanRL returns first)
        reward, last, done = 0.0, window[-1], False
        for i, s in enumerate(window):
            reward += gamma**i * (float(s % 7) - 2.0)
            if s in ends:
                last, done = s, True
                break
        out[window[0]] = (reward, last + 1, done)
        if done:
            window = []
    return out


def nstep_windows(steps, ends, n, gamma):
    """``{t: (reward, next_step, done)}`` of every closed n-step window, the drop-in's rule."""
    out = {}
    for t in range(steps):
        end = next((s for s in range(t, t + n) if s in ends), None)
        if end is None and t + n > steps:
            continue  # still open: its n-th step is not added yet
        last = t + n - 1 if end is None else end
        reward = sum(gamma**i * (float(s % 7) - 2.0) for i, s in enumerate(range(t, last + 1)))
        out[t] = (reward, last + 1, end is not None)
    return out


def filled(steps, ends, *, n=3, gamma=0.9, truncs=(), **kw):
    rb = PrioritizedReplayBuffer(1000, SHAPE, "cpu", n, gamma, seed=0, **kw)
    for args in episode_stream(steps, ends, truncs):
        rb.add(*args[:5], truncated=args[5])
    return rb


def sampled(rb, rounds=30):
    """``{t: (reward, next_step, done, discount)}`` over many batches, each row checked."""
    seen = {}
    for _ in range(rounds):
        b = rb.sample(16)
        t = b.observations[:, -1, 0, 0].numpy().astype(int)
        np.testing.assert_array_equal(b.observations.numpy(), np.stack([stack(s) for s in t]))
        nxt = b.next_observations[:, -1, 0, 0].numpy().astype(int)
        np.testing.assert_array_equal(
            b.next_observations.numpy(), np.stack([stack(s) for s in nxt])
        )
        np.testing.assert_array_equal(b.actions[:, 0].numpy(), t % 5)
        for i, s in enumerate(t):
            row = (b.rewards[i, 0].item(), nxt[i], b.dones[i, 0].item(), b.discounts[i, 0].item())
            assert seen.setdefault(s, row) == row
    return seen


@pytest.mark.parametrize("n", [1, 3, 5])
def test_every_window_cleanrl_stores_is_sampled_with_its_values(n):
    ends, gamma = {9, 20, 21}, 0.9
    ours = sampled(filled(40, ends, n=n, gamma=gamma), rounds=60)
    for model in (cleanrl_windows, nstep_windows):
        for t, (reward, last, done) in model(40, ends, n, gamma).items():
            assert ours[t][1:3] == (last, done), (model.__name__, t)
            assert ours[t][0] == pytest.approx(reward, rel=1e-6), (model.__name__, t)
    # CleanRL drops the windows that start in the last n - 1 steps of an episode
    # (and, after a short episode, the first ones of the next); the drop-in keeps them
    assert ours.keys() == nstep_windows(40, ends, n, gamma).keys()
    dropped = ours.keys() - cleanrl_windows(40, ends, n, gamma).keys()
    assert (len(dropped) > 0) == (n > 1)


def test_a_truncation_given_to_add_ends_the_window_bootstrapped():
    rb = filled(30, set(), n=3, gamma=0.5, truncs={10})
    ours = sampled(rb)
    assert ours[9] == (pytest.approx(ours[9][0]), 11, False, 0.25)  # steps 9, 10
    assert ours[9][0] == pytest.approx((9 % 7 - 2) + 0.5 * (10 % 7 - 2))
    assert ours[12][1:] == (15, False, 0.125)
    # without it, as CleanRL's loop adds, the window runs on into the next episode
    assert sampled(filled(30, set(), n=3, gamma=0.5))[9][1:] == (12, False, 0.125)


def test_batch_types_and_shapes_are_cleanrls():
    b = filled(12, {5}).sample(8)
    assert b.observations.dtype == b.next_observations.dtype == torch.uint8
    assert b.observations.shape == b.next_observations.shape == (8, *SHAPE)
    assert b.actions.dtype == torch.int64 and b.dones.dtype == torch.bool
    assert b.rewards.dtype == b.weights.dtype == torch.float32
    for col in (b.actions, b.rewards, b.dones, b.weights, b.discounts):
        assert col.shape == (8, 1)
    assert isinstance(b.indices, np.ndarray) and b.indices.shape == (8,)


def test_priorities_weights_and_beta_are_cleanrls():
    alpha, eps = 0.5, 1e-3
    rb = filled(40, {30}, n=1, alpha=alpha, eps=eps)
    b = rb.sample(32)
    td = np.linspace(-2.0, 3.0, 32)
    rb.update_priorities(b.indices, td)
    assert rb.max_priority == pytest.approx(3.0 + eps)
    p = {int(i): (abs(x) + eps) ** alpha for i, x in zip(b.indices, td, strict=True)}
    untouched = set(range(40)) - p.keys()
    p.update(dict.fromkeys(untouched, 1.0**alpha))  # a new transition's: max_priority then
    total = sum(p.values())
    for beta in (0.4, 1.0):
        rb.beta = beta
        s = rb.sample(16)
        w = np.array([(40 * p[int(i)] / total) ** -beta for i in s.indices])
        np.testing.assert_allclose(s.weights[:, 0].numpy(), w / w.max(), rtol=1e-5)


def test_memory_is_one_frame_per_step():
    rb = filled(200, {50, 120}, compress=False)
    m = rb.memory()
    assert m["unique_frames"] <= 200 + 3 + 2 * 4  # one per step, plus a stack per reset
    assert m["transitions"] == rb.size == 200


def test_bad_input_is_refused_before_anything_is_stored():
    refused(ValueError, "obs_shape must be a stack", PrioritizedReplayBuffer, 10, (84, 84),
            "cpu", 3, 0.99)  # fmt: skip
    refused(ValueError, "sizes >= 1", PrioritizedReplayBuffer, 10, (4, 0, 8), "cpu", 3, 0.99)
    refused(TypeError, "integer", PrioritizedReplayBuffer, 10, (4, 8.5, 8), "cpu", 3, 0.99)
    for eps in (-1.0, 0.0, float("inf")):
        refused(ValueError, "eps", PrioritizedReplayBuffer, 10, SHAPE, "cpu", 3, 0.99, eps=eps)
    refused(ValueError, "alpha", PrioritizedReplayBuffer, 10, SHAPE, "cpu", 3, 0.99, alpha=-1)
    rb = filled(5, set())
    obs = stack(5)[None]
    one = np.array([1])
    refused(ValueError, "shape", rb.add, obs[:, :3], one, one, obs, one > 0)
    refused(TypeError, "uint8", rb.add, obs.astype(np.float32), one, one, obs, one > 0)
    refused(ValueError, "finite", rb.add, obs, one, one * np.nan, obs, one > 0)
    refused(ValueError, r"obs must be of shape \(4, 8, 8\)", rb.add, obs[..., :4], one,
            one, obs, one > 0)  # fmt: skip
    refused(TypeError, "next_obs must be uint8", rb.add, obs, one, one, obs.astype(np.int8),
            one > 0)  # fmt: skip
    refused(TypeError, "not None", rb.add, obs, one, one, obs, None)
    refused(ValueError, "at least 1", rb.sample, -1)
    assert rb.size == 5
