"""Scheduling: requests in, batches out. The loop (`scheduler`), admission (`admission`), the KV
manager that alone owns KV slots and tree locks (`kv_manager`), batch layout (`batch`) and
output processing (`output`, `jump_forward`)."""
