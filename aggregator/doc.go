// Package aggregator assembles the aggregator that measures how accurate
// the edge tier's rate limiting is (cmd/aggregator is its command, whose
// documentation says what it does and in what order it stops): a consumer
// group reading the edges' decision events from Kafka, the judge (package
// judge) that checks each decision against the exact reference of its
// rule's algorithm, the tally of global rules' keys published to the
// edges of every PoP (package global), an embedded Kafka-protocol broker
// (franz-go's kfake) when no brokers are given, and the HTTP server of
// /metrics, /report and /healthz.
//
// Config holds every setting with its default written once, as a
// constant of this package or of the package that owns it; a zero Config
// is an aggregator at those defaults, and the command's flags take them as
// theirs. The command and the tests build an aggregator through Start:
//
//	a, err := aggregator.Start(ctx, aggregator.Config{}, slog.Default())
//	if err != nil {
//		return err
//	}
//	defer a.Close()
//	fmt.Println("report on http://" + a.Addr() + "/report, brokers", a.Brokers())
package aggregator
