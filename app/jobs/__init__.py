"""Jobs: batch audits and training that outlive a request, on a task queue with a SQL store."""
