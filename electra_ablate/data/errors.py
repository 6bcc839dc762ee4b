"""The error every bad data input ends in: corpus, vocabulary or data config, with the problem and the fix."""


class DataError(ValueError):
    """Bad data input (corpus, vocabulary, data config); the message names the problem and the fix."""
