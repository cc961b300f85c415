-- The reference service's entity. Written in the same transaction that
-- completes its idempotency key, so a stored success implies a payment.
create table payments (
  id               uuid        primary key default gen_random_uuid(),
  tenant           text        not null check (length(tenant) between 1 and 64),
  amount           bigint      not null check (amount between 1 and 1000000000000),
  currency         text        not null check (currency ~ '^[A-Z]{3}$'),
  customer         text        not null check (length(customer) between 1 and 64),
  description      text        check (length(description) <= 500),
  status           text        not null check (status in ('succeeded')),
  provider_ref     text        not null check (length(provider_ref) between 1 and 64),
  idempotency_key  text        not null check (length(idempotency_key) between 1 and 255),
  created_at       timestamptz not null default clock_timestamp()
);

-- Listing a customer's payments newest first, by keyset.
create index payments_tenant_customer_created
  on payments (tenant, customer, created_at desc, id desc);
