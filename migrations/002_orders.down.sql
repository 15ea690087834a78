DROP TABLE order_events, order_items, orders;
