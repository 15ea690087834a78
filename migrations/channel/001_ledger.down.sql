DROP TABLE counters;
DROP TABLE unavailable_given;
DROP TABLE attempts;
DROP TABLE refunds;
DROP TABLE charges;
