"""What a worker shows of itself: log lines with the job, round, rank and step; its timeline;
its step pace; the build queries."""
