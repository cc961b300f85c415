-- A charge id comes from the provider, which may be any service: 64
-- characters fitted only our own simulator's ids.
alter table payments drop constraint payments_provider_ref_check;
alter table payments add constraint payments_provider_ref_check check (length(provider_ref) between 1 and 255);
