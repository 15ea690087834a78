DROP TABLE IF EXISTS order_outbox;
