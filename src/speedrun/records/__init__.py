"""What a run leaves behind and how it is named: run-dir files, the results database, the identity of a config and
of the code and card that ran it, and the grep-able result block."""
