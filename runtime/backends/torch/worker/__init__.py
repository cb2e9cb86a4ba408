"""The worker side of a torch run: the persistent worker process (one per device), its environment, the sending
thread, fused members' threads and what it measures of its memory."""
