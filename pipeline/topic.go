package pipeline

// DefaultTopic is the topic of decision events that the edges write and
// the aggregator reads, when neither is told another (edge.Options.Topic,
// the aggregator's -topic): one name, so that both meet on it.
const DefaultTopic = "poplimit.decisions"
