"""The communicator (the public API: validation, the schedule, ``Work``, shrink) and its start-up
(``rendezvous``: rails, the store exchange, the links)."""
