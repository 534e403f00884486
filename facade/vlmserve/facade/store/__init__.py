"""What the facade keeps: responses, conversations, their events and the facade leases, as
async repositories on one SQLite or PostgreSQL database (`repositories.Store`); uploaded files on
disk (`files.FileRepository`); quotas, upkeep and free disk space."""
