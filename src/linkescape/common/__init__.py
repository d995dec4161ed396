"""What every floor shares: the typed errors, the configuration, events and logs, the store and
the job's key, reduce operations, JSON lines, optional extras, private files, and the helpers of
the tests. Each of these modules also imports under its old name (``linkescape.config``...:
``linkescape.MOVED``)."""
