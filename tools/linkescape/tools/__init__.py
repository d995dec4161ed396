"""The operators' commands (integrations: status, trace analyze, report, cost, simulate) and the timeline they share with the demo."""
