DROP INDEX IF EXISTS payments_order;
