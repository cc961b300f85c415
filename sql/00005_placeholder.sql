-- Placeholder on branch wip-20 only: main's 00005 (the lead's engine
-- migration) takes this number at merge, and this file is dropped then.
-- postgres-shift refuses a gap in the numbering, so 00006 needs a 00005.
select 1;
