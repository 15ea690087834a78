-- Reading an order loads its payments by order_id, oldest first; the
-- partial unique indexes cannot serve that, so without this every read of
-- an order scanned the whole payments table.
CREATE INDEX payments_order ON payments (order_id, created_at, id);
