-- @contract requires service 4
-- Every admin session is bound to the credential that opened it (00004).
-- Sessions of the release before 00004 have no tag: this release ends them at
-- their first use, and that release would go on writing new ones without it.
-- So once no process of that release serves (the runner waits for that), they
-- go, and a session without its tag can never be written again.
--
-- SET NOT NULL reads the table under its lock: admin_sessions holds a few
-- rows per operator (MAX_SESSIONS_PER_OPERATOR), so that is milliseconds.
delete from admin_sessions where credential is null;
alter table admin_sessions alter column credential set not null;
