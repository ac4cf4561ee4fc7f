"""Masked CRC32C (Castagnoli) checks of TFRecord framing, many records at a time.

TensorBoard event files frame every record as ``uint64 length | masked crc32c(length) | payload |
masked crc32c(payload)``. Checking millions of small records one call at a time costs more than reading
them, so the checks here take whole arrays of record offsets:

- lengths (8 bytes each) are always checked with a vectorised numpy table CRC;
- payloads up to :data:`VECTOR_MAX_BYTES` are checked the same way, byte column by byte column over the
  records sorted by length (the work is the total number of bytes plus one numpy call per byte position);
- longer payloads (graphs, images, histograms: never scalars) are checked with ``google-crc32c`` or
  ``crc32c`` when one is installed, and are left unchecked otherwise (they are not read either).

No compiled extension is needed; the optional ones only speed up files with large records.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

VECTOR_MAX_BYTES = 16_384
"""Payloads up to this size are checked by the vectorised CRC; larger ones need a native crc32c."""
_MASK_DELTA = 0xA282EAD8
_POLY = 0x82F63B78


def _table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


TABLE = _table()


def _native() -> Callable[[bytes], int] | None:
    try:
        import google_crc32c

        return google_crc32c.value
    except ImportError:
        pass
    try:
        import crc32c

        return crc32c.crc32c
    except ImportError:
        return None


NATIVE_CRC = _native()
"""A compiled crc32c function when ``google-crc32c`` or ``crc32c`` is installed, else ``None``."""


def mask(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masking of a CRC: rotate right by 15 bits and add a constant (mod 2**32)."""
    crc = crc.astype(np.uint64)
    rotated = ((crc >> np.uint64(15)) | (crc << np.uint64(17))) & np.uint64(0xFFFFFFFF)
    return ((rotated + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _slicing_tables() -> np.ndarray:
    """Four tables for slicing-by-4: one step consumes four bytes."""
    tables = [TABLE]
    for _ in range(3):
        prev = tables[-1]
        tables.append(((prev >> 8) ^ TABLE[prev & 0xFF]).astype(np.uint32))
    return np.stack(tables)


SLICE4 = _slicing_tables()


def _halfword_tables() -> tuple[np.ndarray, np.ndarray]:
    """Slicing-by-4 folded into two 65,536-entry tables: a 4-byte step is two lookups, of its low and high half
    (``LOW[x & 0xFFFF] ^ HIGH[x >> 16]`` equals ``t3[b0] ^ t2[b1] ^ t1[b2] ^ t0[b3]`` for ``x``'s bytes b0..b3)."""
    t0, t1, t2, t3 = SLICE4
    half = np.arange(1 << 16, dtype=np.uint32)
    low = (t3[half & 0xFF] ^ t2[half >> 8]).astype(np.uint32)
    high = (t1[half & 0xFF] ^ t0[half >> 8]).astype(np.uint32)
    return low, high


LOW16, HIGH16 = _halfword_tables()
_GROUP_MIN = 64
"""Records of one length needed before they get the fixed-length (slicing-by-4) path."""
_GROUP_ROWS = 65_536


def word_view(data: np.ndarray, align: int) -> np.ndarray:
    """``data`` read as little-endian 32-bit words from byte ``align`` on (a view, no copy; unaligned is fine)."""
    return np.ndarray(((len(data) - align) // 4,), dtype="<u4", buffer=data, offset=align)


def _by_alignment(starts: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``(align, rows, word index)`` for each alignment of ``starts`` that occurs: ``word_view(data, align)[index]``
    is the word at each of those rows' starts."""
    align = starts & 3
    groups = []
    for a in range(4):
        rows = np.flatnonzero(align == a)
        if len(rows):
            groups.append((a, rows, (starts[rows] - a) >> 2))
    return groups


def gather_words(data: np.ndarray, starts: np.ndarray, words: int) -> np.ndarray:
    """The ``words`` little-endian 32-bit words from each offset of ``starts``, as ``[len(starts), words]``: a
    quarter of the gathers of a byte block. Every ``start + 4 * words`` must lie within ``data``.

    >>> gather_words(np.arange(12, dtype=np.uint8), np.array([0, 1]), 2).tolist() == [
    ...     [0x03020100, 0x07060504], [0x04030201, 0x08070605]]
    True
    """
    out = np.empty((len(starts), words), dtype=np.uint32)
    for a, rows, index in _by_alignment(starts):
        out[rows] = word_view(data, a)[index[:, None] + np.arange(words)]
    return out


def _crc_fixed(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """CRC32C of equal-length ranges, four bytes per step: each step's word gathered for every range at once from
    the word view at the range's alignment (column by column: no block is built), the last ``length % 4`` bytes
    one by one."""
    crc = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    words = length // 4
    for a, rows, index in _by_alignment(starts) if words else []:
        view = word_view(data, a)
        part = crc[rows]
        for w in range(words):
            x = part ^ view[index + w]
            part = LOW16[x & 0xFFFF] ^ HIGH16[x >> 16]
        crc[rows] = part
    for j in range(4 * words, length):
        crc = TABLE[(crc ^ data[starts + j]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def _crc_ragged(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of ranges of any lengths, one byte position at a time over the records still that long."""
    order = np.argsort(-lengths, kind="stable")
    sorted_starts = starts[order]
    sorted_lengths = lengths[order]
    crc = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    max_length = int(sorted_lengths[0]) if len(sorted_lengths) else 0
    # active[i] = how many records are longer than i: a prefix of the length-sorted order.
    active = np.searchsorted(-sorted_lengths, -np.arange(max_length), side="left")
    for i in range(max_length):
        n = int(active[i])
        part = crc[:n]
        crc[:n] = TABLE[(part ^ data[sorted_starts[:n] + i]) & 0xFF] ^ (part >> 8)
    out = np.empty_like(crc)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


PADDED_MAX_WORDS = 64
"""Ranges of up to this many 32-bit words (256 bytes) are checked together, whatever their lengths
(:func:`_crc_short`), when the data extends far enough past them."""
_WIDTHS = (4, 8, 16, 32, PADDED_MAX_WORDS)


def _crc_short(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, words: int) -> np.ndarray:
    """CRC32C of ranges of different lengths of at most ``4 * words`` bytes, all at once: ``words`` words read at
    every start (the data must extend that far), the ranges sorted by length so that word ``w`` is folded into the
    prefix of ranges still that long (four bytes a step, two half-word lookups), the last 0-3 bytes of each range
    one by one. The numpy calls do not grow with the number of distinct lengths (a scalar log has dozens, each at
    four alignments), which keeps small blocks of records cheap."""
    order = np.argsort(-lengths, kind="stable")
    sorted_starts, sorted_lengths = starts[order], lengths[order]
    block = np.ascontiguousarray(gather_words(data, sorted_starts, words).T)  # [word, range]
    full = sorted_lengths >> 2
    # ranges[w] = how many ranges have more than w whole words: a prefix of the length-sorted order
    ranges = np.searchsorted(-full, -np.arange(words), side="left")
    crc = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    for w in range(words):
        n = int(ranges[w])
        if not n:
            break
        x = crc[:n] ^ block[w, :n]
        crc[:n] = LOW16[x & 0xFFFF] ^ HIGH16[x >> 16]
    rest = sorted_lengths & 3
    tails = np.flatnonzero(rest)
    if len(tails):
        last = block[np.minimum(full[tails], words - 1), tails]  # the word holding the 1-3 bytes left
        part, left = crc[tails], rest[tails]
        for j in range(3):
            on = left > j
            if not on.any():
                break
            byte = (last >> np.uint32(8 * j)) & np.uint32(0xFF)
            stepped = TABLE[(part ^ byte) & 0xFF] ^ (part >> 8)
            part = np.where(on, stepped, part)
        crc[tails] = part
    out = np.empty_like(crc)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def crc32c_many(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of ``data[starts[i] : starts[i] + lengths[i]]`` for every i, vectorised over records.

    Ranges of up to 256 bytes with the data extending 256 bytes past their start (a block of records with
    room after it) are folded in four at a time, all lengths together (:func:`_crc_short`). Of the others,
    lengths shared by many records take a slicing-by-4 pass per length; the rest go byte by byte over the
    records sorted by length.

    >>> buf = np.frombuffer(b"123456789", dtype=np.uint8)
    >>> hex(int(crc32c_many(buf, np.array([0]), np.array([9]))[0]))
    '0xe3069283'
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(len(starts), dtype=np.uint32)
    room = (starts + 4 * PADDED_MAX_WORDS <= len(data)) & (lengths <= 4 * PADDED_MAX_WORDS) & (lengths > 0)
    if room.any():
        short = np.flatnonzero(room)
        need = (lengths[short] + 3) >> 2
        lower = 0
        for width in _WIDTHS:
            rows = short[(need > lower) & (need <= width)]
            if len(rows):
                out[rows] = _crc_short(data, starts[rows], lengths[rows], width)
            lower = width
        if len(short) == len(starts):
            return out
        rest = np.flatnonzero(~room)
        out[rest] = _crc_long(data, starts[rest], lengths[rest])
        return out
    return _crc_long(data, starts, lengths)


def _crc_long(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`crc32c_many` without the short-range path: a slicing-by-4 pass per length shared by many ranges, the
    rest byte by byte."""
    out = np.empty(len(starts), dtype=np.uint32)
    order = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[order]
    bounds = np.flatnonzero(np.diff(sorted_lengths)) + 1
    ragged = []
    for rows in np.split(order, bounds) if len(order) else []:
        length = int(lengths[rows[0]])
        if len(rows) < _GROUP_MIN:
            ragged.append(rows)
            continue
        for lo in range(0, len(rows), _GROUP_ROWS):
            part = rows[lo : lo + _GROUP_ROWS]
            out[part] = _crc_fixed(data, starts[part], length)
    if ragged:
        rows = np.concatenate(ragged)
        out[rows] = _crc_ragged(data, starts[rows], lengths[rows])
    return out


def masked_crc32c_many(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Masked CRC32C of many byte ranges of ``data`` (see :func:`crc32c_many`).

    >>> buf = np.frombuffer((0).to_bytes(8, "little"), dtype=np.uint8)
    >>> int(masked_crc32c_many(buf, np.array([0]), np.array([8]))[0]) == masked_crc32c(bytes(8))
    True
    """
    return mask(crc32c_many(data, starts, lengths))


def masked_crc32c(payload: bytes) -> int:
    """Masked CRC32C of one byte string (native when available).

    >>> masked_crc32c(b"")
    2726488792
    """
    if NATIVE_CRC is not None:
        value = NATIVE_CRC(payload)
    else:
        value = int(crc32c_many(np.frombuffer(payload, dtype=np.uint8), np.array([0]), np.array([len(payload)]))[0])
    return int(mask(np.array([value], dtype=np.uint32))[0])
