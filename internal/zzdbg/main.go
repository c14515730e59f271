package main

import (
	"os"
	"time"

	"github.com/poplimit/poplimit/loadtest"
)

func main() {
	rate, d := 2000.0, 15*time.Second
	zipf, _ := loadtest.Zipf(loadtest.ZipfConfig{Seed: 1, Clients: 2000, Rate: rate * 0.9, Duration: d})
	abuser, _ := loadtest.Abuser(loadtest.AbuserConfig{Seed: 2, Rate: max(60, rate*0.05), Duration: d})
	perIP := rate * 0.05 / 3
	stuffing, _ := loadtest.Stuffing(loadtest.StuffingConfig{Seed: 3, Rate: perIP, Attempts: 3, Gap: time.Second, IPs: max(1, int(perIP*d.Seconds()))})
	loadtest.WriteTrace(os.Stdout, loadtest.Mix(zipf, abuser, stuffing))
}
