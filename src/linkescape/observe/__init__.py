"""What operators read of a rank: the flight recorder, the metrics and their HTTP server. Started
by the communicator; they read the engine's state, they never change it."""
