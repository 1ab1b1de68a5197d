"""tf.io.decode_image, but a file it cannot decode fails naming the file.

An op that fails inside a tf.data map raises InvalidArgumentError with the op's name and
not the element's, and the graph cannot catch it. So each file is looked at first (a few
bytes at each end): one that starts as a format decode_image reads and ends whole (a
JPEG's end-of-image marker, a PNG's IEND chunk, a GIF's trailer, a BMP as long as its
header says) decodes in the graph, as fast as before; any other (truncated, another
format, trailing bytes) decodes in Python (`tf.py_function`), which names the file when
decode_image refuses it: tf.data raises InvalidArgumentError, the type decode_image's own
error has, its message ending "ValueError: FILE: cannot decode: ...". A file whose ends
are whole but whose middle is damaged still fails with TensorFlow's own message.
"""

from __future__ import annotations

import tensorflow as tf

_PNG_HEAD = b"\x89PNG\r\n\x1a\n"
_PNG_TAIL = b"IEND\xaeB`\x82"


def looks_whole(data: tf.Tensor) -> tf.Tensor:
    """Whether the encoded image `data` (a scalar string) starts and ends as a whole
    JPEG, PNG, GIF or BMP does."""
    n = tf.strings.length(data)

    def tail(k: int) -> tf.Tensor:
        return tf.strings.substr(data, tf.maximum(n - k, 0), k)

    head = tf.strings.substr(data, 0, 8)
    jpeg = tf.logical_and(tf.equal(tf.strings.substr(head, 0, 2), b"\xff\xd8"),
                          tf.equal(tail(2), b"\xff\xd9"))
    png = tf.logical_and(tf.equal(head, _PNG_HEAD), tf.equal(tail(8), _PNG_TAIL))
    gif = tf.logical_and(tf.equal(tf.strings.substr(head, 0, 4), b"GIF8"), tf.equal(tail(1), b";"))
    return tf.reduce_any(tf.stack([jpeg, png, gif, _whole_bmp(data, n)]))


def _whole_bmp(data: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """A BMP has no trailer: its header's file size (bytes 2-5, little-endian) must be
    the length read."""
    def declared() -> tf.Tensor:
        raw = tf.io.decode_raw(tf.strings.substr(data, 2, 4), tf.uint8)
        size = tf.reduce_sum(tf.cast(raw, tf.int64) * tf.constant([1, 256, 65536, 16777216], tf.int64))
        return tf.equal(size, tf.cast(n, tf.int64))

    is_bmp = tf.logical_and(n >= 14, tf.equal(tf.strings.substr(data, 0, 2), b"BM"))
    return tf.cond(is_bmp, declared, lambda: tf.constant(False))


def _decode_in_python(data: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
    def decode(data: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
        try:
            return tf.io.decode_image(data, channels=3, expand_animations=False)
        except tf.errors.InvalidArgumentError as exc:
            name = path.numpy().decode(errors="replace")
            # A ValueError: tf.data turns it into InvalidArgumentError (an OSError would
            # become UnknownError), so what callers catch stays what TensorFlow raises.
            raise ValueError(f"{name}: cannot decode: {exc.message}") from exc

    image = tf.py_function(decode, [data, path], tf.uint8)
    image.set_shape([None, None, 3])
    return image


def decode_named(data: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
    """uint8 H×W×3 of the encoded image `data`, read from `path` (see the module)."""
    def in_graph() -> tf.Tensor:
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        return image

    return tf.cond(looks_whole(data), in_graph, lambda: _decode_in_python(data, path))
