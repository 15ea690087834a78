DROP TABLE order_outbox;
