"""Vectorised decoding of the commonest TensorBoard record: one ``simple_value`` scalar per event.

PyTorch's ``SummaryWriter.add_scalar`` (and TF1's scalar summaries) write every point as an ``Event`` whose
serialised bytes have one fixed shape::

    09 <wall_time: 8 bytes>  10 <step: varint>  2a <len> [ 0a <len> [ 0a <len> <tag bytes>  15 <value: 4 bytes> ] ]

(protobuf fields 1, 2 and 5 of Event; field 1 of Summary; fields 1 and 2 of Summary.Value). Parsing
millions of these one protobuf call at a time costs microseconds each in Python attribute access. Here
all records are checked against that shape at once with numpy and decoded as arrays; every record that
deviates in any byte (step 0 or wall time 0, which protobuf omits, tensors, several values per event,
metadata, session logs, other summaries) is left to the protobuf parser. A record either matches the shape
exactly, length fields included, or is not decoded here, so the result equals protobuf's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collapse_doctor.io.logs.crc32c import gather_words

PAD = 32
"""Bytes the data must extend past the last payload (zero padding, or whatever follows in a buffer), so that the
fixed-width gathers near the end stay in bounds."""
_MAX_VARINT = 9
"""Steps up to 2**63 - 1 (9 varint bytes); negative steps (10 bytes) go to protobuf."""


@dataclass
class FastScalars:
    """Decoded ``simple_value`` records: which records, and their tag ids, steps, values, wall times."""

    matched: np.ndarray
    """``[R]`` bool over all records: decoded here (True) or left to protobuf (False)."""
    records: np.ndarray
    tag_names: list[str]
    tag_index: np.ndarray
    steps: np.ndarray
    values: np.ndarray
    """``float32``: the value as stored (widened losslessly where the points are kept)."""
    wall_times: np.ndarray


def _varint(buf: np.ndarray, at: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode varints of at most ``width`` bytes at ``at``: (value, byte count, ok).

    One pass per byte position, over the rows whose varint has not ended yet (steps of a 100k-step log take 3).

    >>> buf = np.array([0x96, 0x01, 0x05, 0xFF, 0xFF], dtype=np.uint8)
    >>> [a.tolist() for a in _varint(buf, np.array([0, 2, 3]), 2)]
    [[150, 5, 16383], [2, 1, 2], [True, True, False]]
    """
    value = np.zeros(len(at), dtype=np.uint64)
    count = np.full(len(at), width, dtype=np.int64)
    ok = np.zeros(len(at), dtype=bool)
    active = np.arange(len(at))
    for j in range(width):
        byte = buf[at[active] + j]
        value[active] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * j)
        ended = (byte & 0x80) == 0
        done = active[ended]
        count[done] = j + 1
        ok[done] = True
        active = active[~ended]
        if not len(active):
            break
    return value, count, ok


def _gather(buf: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    cols = buf[at[:, None] + np.arange(width)]
    return np.ascontiguousarray(cols).view(dtype).reshape(-1)


def _row_codes(rows: np.ndarray) -> np.ndarray:
    """Dense codes of equal rows of a ``[n, width]`` integer block (hash, then check; exact either way)."""
    h = np.full(len(rows), 0xCBF29CE484222325, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    for column in rows.T:
        h = (h ^ column.astype(np.uint64)) * prime
        h ^= h >> np.uint64(29)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if np.array_equal(rows, rows[first[inverse]]):
        return inverse
    keys = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).reshape(-1)
    return np.unique(keys, return_inverse=True)[1].reshape(-1)  # a hash collision: compare the bytes


def _words(buf: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """The ``length`` bytes at each start as 32-bit words, the bytes of the last word beyond ``length`` zeroed
    (``buf`` is padded past its end, so the last word may be read whole)."""
    out = gather_words(buf, starts, -(-length // 4))
    if length % 4:
        out[:, -1] &= np.uint32((1 << (8 * (length % 4))) - 1)
    return out


_SHORT_TAG_WORDS = 16
"""Tags of up to this many 32-bit words (64 bytes, nearly all) are told apart all at once, whatever their lengths."""
_BYTE_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], dtype=np.uint32)


def _short_tag_codes(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Dense codes of equal byte ranges (at most 64 bytes each): the words of every range gathered at once, the
    bytes past its end zeroed, the length as one more column (so the numpy calls do not grow with the number of
    distinct tag lengths). ``buf`` must extend 3 bytes past each range."""
    width = max(1, (int(lengths.max()) + 3) // 4)
    words = gather_words(buf, starts, width)
    valid = np.clip(lengths[:, None] - 4 * np.arange(width), 0, 4)
    words &= _BYTE_MASKS[valid]
    return _row_codes(np.column_stack([words, lengths.astype(np.uint32)]))


def _tag_ids(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Tag ids for byte ranges: rows grouped by their bytes (short tags all at once, longer ones per length)."""
    names: dict[bytes, int] = {}
    ids = np.empty(len(starts), dtype=np.int32)
    short = np.flatnonzero(lengths <= 4 * _SHORT_TAG_WORDS)
    if len(short):
        codes = _short_tag_codes(buf, starts[short], lengths[short])
        first = np.zeros(int(codes.max()) + 1, dtype=np.int64)
        first[codes[::-1]] = np.arange(len(codes))[::-1]
        spans = zip(starts[short][first].tolist(), lengths[short][first].tolist(), strict=True)
        local = np.asarray([names.setdefault(buf[at : at + n].tobytes(), len(names)) for at, n in spans])
        ids[short] = local[codes]
    long_lengths = lengths[lengths > 4 * _SHORT_TAG_WORDS]
    for length in np.unique(long_lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        if length == 0:
            ids[rows] = names.setdefault(b"", len(names))
            continue
        at = starts[rows]
        codes = _row_codes(_words(buf, at, length))
        first = np.zeros(int(codes.max()) + 1, dtype=np.int64)
        first[codes[::-1]] = np.arange(len(codes))[::-1]
        local = np.asarray(
            [names.setdefault(buf[int(at[i]) : int(at[i]) + length].tobytes(), len(names)) for i in first.tolist()],
            dtype=np.int32,
        )
        ids[rows] = local[codes]
    # Tags whose bytes differ but decode alike (invalid UTF-8 replaced) are one tag, as protobuf's parser gives.
    decoded: dict[str, int] = {}
    remap = np.asarray([decoded.setdefault(raw.decode("utf-8", errors="replace"), len(decoded)) for raw in names])
    return list(decoded), (remap[ids].astype(np.int32) if len(remap) else ids)


def decode_simple_values(
    data: bytes | np.ndarray, payload_starts: np.ndarray, payload_lengths: np.ndarray
) -> FastScalars:
    """Decode every record of ``data`` that is a lone ``simple_value`` scalar event (see the module docstring).

    ``data`` as bytes is padded here (a copy); as a ``uint8`` array it is used in place and must extend at least
    :data:`PAD` bytes past the last payload (the bytes there are never part of a decoded record).
    """
    buf = data if isinstance(data, np.ndarray) else np.frombuffer(bytes(data) + bytes(PAD), dtype=np.uint8)
    p = payload_starts.astype(np.int64)
    end = p + payload_lengths.astype(np.int64)
    n = len(p)
    ok = (payload_lengths >= 20) & (buf[p] == 0x09) & (buf[np.minimum(p + 9, len(buf) - 1)] == 0x10)
    idx = np.flatnonzero(ok)
    p, end = p[idx], end[idx]
    step, k, good = _varint(buf, p + 10, _MAX_VARINT)
    q = p + 10 + k
    good &= buf[q] == 0x2A
    summary_len, ks, good_s = _varint(buf, q + 1, 2)
    r = q + 1 + ks
    good &= good_s & (buf[r] == 0x0A)
    value_len, kv, good_v = _varint(buf, r + 1, 2)
    u = r + 1 + kv
    good &= good_v & (buf[u] == 0x0A)
    tag_len, kt, good_t = _varint(buf, u + 1, 2)
    tag_start = u + 1 + kt
    f = tag_start + tag_len.astype(np.int64)
    good &= good_t & (f + 5 == end)
    f = np.where(good, f, p)  # keep the gathers below in bounds for rejected rows
    good &= buf[f] == 0x15
    good &= summary_len.astype(np.int64) == end - (q + 1 + ks)
    good &= value_len.astype(np.int64) == end - (r + 1 + kv)
    keep = np.flatnonzero(good)
    matched = np.zeros(n, dtype=bool)
    records = idx[keep]
    matched[records] = True
    p, f, tag_start = p[keep], f[keep], tag_start[keep]
    names, tag_index = _tag_ids(buf, tag_start, (f - tag_start))
    return FastScalars(
        matched=matched,
        records=records,
        tag_names=names,
        tag_index=tag_index,
        steps=step[keep].astype(np.int64),
        values=_gather(buf, f + 1, 4, "<f4"),
        wall_times=_gather(buf, p + 1, 8, "<f8"),
    )
