-- @online
-- The key table filled whole once claims take the new form (sql/engine/00023):
-- a key of that form never grows, so the payments' fillfactor of 00007 (35,
-- room for a completed answer beside each claim) only wastes pages.
--
-- Only where the form is new. On a new database the engine's line runs first,
-- and 00007 would otherwise leave 35 after the engine's 100. On a database
-- whose switch is still pending (a process of a release before engine 20
-- serves), the old form's completions still need the room: the engine's
-- 00023 fills the table whole when it runs.
--
-- Online: a storage parameter (SHARE UPDATE EXCLUSIVE, which no read or write
-- waits on), used as pages are next filled.
do $$
begin
  if exists (select 1 from idempotency_key_form where id = 1 and form = 'new') then
    alter table idempotency_keys set (fillfactor = 100);
  end if;
end
$$;
