"""Layout: the per-position facts that decide which key each query may see (segments, indices,
positions, prefix flags, causal and window settings), so no implementation needs an L x S mask."""

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Layout:
  """Per-position facts that decide which key each query may see.

  Kept per position (not as an L x S mask) so blockwise implementations build only the
  block they need. segment 0 marks padding; tokens of different segments (documents packed
  into one row) never see each other. `idx` is the index in the sequence (causality and the
  window), `pos` the position the positional scheme sees (restarts in each packed document).
  """
  q_seg_BL: jax.Array
  k_seg_BS: jax.Array
  q_idx_BL: jax.Array
  k_idx_BS: jax.Array
  q_pos_BL: jax.Array
  k_pos_BS: jax.Array
  k_prefix_BS: jax.Array | None = None  # prefix-LM: keys every query of the segment may see
  causal: bool = struct.field(pytree_node=False, default=False)
  window: int = struct.field(pytree_node=False, default=0)
  # d = (q_idx[:, i] - i) - (k_idx[:, j] - j) for every row, i and j, where that is known at
  # trace time (make_layout and its slices): lets blockwise code skip keys no query of a
  # block can see. None: unknown (any code that builds other index arrays must say so).
  index_offset: int | None = struct.field(pytree_node=False, default=None)
  # What the segment arrays are known to hold at trace time (kernels that take sequence
  # lengths instead of segment ids need it): "single" every position is segment 1;
  # "right_padded" each row is one segment followed by padding (0); "packed" anything
  # (several documents per row, left padding, ...). A promise: nothing checks the arrays.
  segments: str = struct.field(pytree_node=False, default="packed")

  def mask(self) -> jax.Array:
    """bool [B, 1, L, S]: True where query l may attend to key s."""
    q_seg, k_seg = self.q_seg_BL[:, :, None], self.k_seg_BS[:, None, :]
    allowed = (q_seg == k_seg) & (k_seg != 0)
    offset = self.q_idx_BL[:, :, None] - self.k_idx_BS[:, None, :]
    if self.causal:
      visible = offset >= 0
      if self.k_prefix_BS is not None:
        visible |= self.k_prefix_BS[:, None, :]
      allowed &= visible
    if self.window:
      allowed &= jnp.abs(offset) < self.window
    return allowed[:, None]

  def slice(self, q: slice | None = None, k: slice | None = None) -> "Layout":
    """The layout of a block of queries and/or keys (static slices)."""
    out = self
    if q is not None:
      out = out.replace(q_seg_BL=out.q_seg_BL[:, q], q_idx_BL=out.q_idx_BL[:, q],
                        q_pos_BL=out.q_pos_BL[:, q], index_offset=_shift(out.index_offset, q))
    if k is not None:
      out = out.replace(k_seg_BS=out.k_seg_BS[:, k], k_idx_BS=out.k_idx_BS[:, k],
                        k_pos_BS=out.k_pos_BS[:, k],
                        k_prefix_BS=None if out.k_prefix_BS is None else out.k_prefix_BS[:, k],
                        index_offset=_shift(out.index_offset, k, sign=-1))
    return out

  def visible_keys(self, q_start: int, q_stop: int, k_len: int) -> tuple[int, int]:
    """A range of keys outside which no query in [q_start, q_stop) sees anything: the keys
    at or below the diagonal of a causal block, within the window of a windowed one."""
    d = self.index_offset
    if d is None or self.k_prefix_BS is not None:
      return 0, k_len
    lo, hi = 0, k_len
    if self.causal:
      hi = q_stop + d
    if self.window:
      lo = q_start + d - self.window + 1
      if not self.causal:
        hi = q_stop - 1 + d + self.window
    return min(max(lo, 0), k_len), min(max(hi, 0), k_len)


def _shift(offset, s: slice, sign=1):
  if offset is None or s.step not in (None, 1):
    return None
  return offset + sign * (s.start or 0)


SEGMENT_KINDS = ("single", "right_padded", "packed")


def make_layout(q_len: int, k_len: int, *, batch: int, q_segments=None, k_segments=None,
                q_positions=None, k_positions=None, prefix=None, causal=False, window=0,
                q_offset=0, segments: str | None = None) -> Layout:
  """A Layout with defaults: one segment, positions = indices. q_offset shifts query indices
  (a decoding step's queries sit after the cached keys). `segments` (see Layout) defaults to
  "single" without segment arrays and to "packed" (anything) with them."""
  if segments is None:
    segments = "single" if q_segments is None and k_segments is None else "packed"
  if segments not in SEGMENT_KINDS:
    raise ValueError(f"Unknown segments {segments!r}; valid: {SEGMENT_KINDS}.")
  def default(x, n, fill):
    return jnp.broadcast_to(fill(n), (batch, n)) if x is None else x.astype(jnp.int32)

  q_idx = jnp.broadcast_to(jnp.arange(q_len, dtype=jnp.int32) + q_offset, (batch, q_len))
  k_idx = jnp.broadcast_to(jnp.arange(k_len, dtype=jnp.int32), (batch, k_len))
  ones = lambda n: jnp.ones((n,), jnp.int32)
  return Layout(
      q_seg_BL=default(q_segments, q_len, ones), k_seg_BS=default(k_segments, k_len, ones),
      q_idx_BL=q_idx, k_idx_BS=k_idx,
      q_pos_BL=q_idx if q_positions is None else q_positions.astype(jnp.int32),
      k_pos_BS=k_idx if k_positions is None else k_positions.astype(jnp.int32),
      k_prefix_BS=prefix, causal=causal, window=window,
      index_offset=q_offset if isinstance(q_offset, int) else None, segments=segments)
