// Command dcgmcounters reads dcgm-exporter counters files the way dcgm-exporter 4.x does, for gpushare's tests.
//
// dcgm-exporter's own reader (internal/pkg/counters, ReadCSVFile and ExtractCounters) cannot be built here: its
// module is not served by the Go module proxy, and the package links go-dcgm (cgo, DCGM's libraries). So this program
// does what that code does with Go's own encoding/csv: Comment '#' and every other Reader setting at its default,
// ReadAll, then per record the fields trimmed of spaces, exactly three, a name from go-dcgm's field table or the
// exporter's DCGM_EXP_* names (the table gpushare keeps, -fields), and a type the exporter knows.
//
//	dcgmcounters -fields dcgm-fields.csv FILE...
//
// prints one JSON object per file ({"file", "error", "records"}) and exits 1 when any file is refused.
package main

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// The exporter's promMetricType (internal/pkg/counters/variables.go).
var promTypes = map[string]bool{"gauge": true, "counter": true, "histogram": true, "summary": true, "label": true}

type record struct {
	Line int    `json:"line"`
	Name string `json:"name"`
	Type string `json:"type"`
	Help string `json:"help"`
}

type result struct {
	File    string   `json:"file"`
	Error   string   `json:"error,omitempty"`
	Records []record `json:"records"`
}

func readFields(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	known := map[string]string{}
	for _, row := range rows[1:] { // rows[0] is the header: name,id,kind
		known[row[0]] = row[2]
	}
	return known, nil
}

func check(path string, known map[string]string) result {
	res := result{File: path, Records: []record{}}
	f, err := os.Open(path)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	// ReadAll as the exporter does: the first error refuses the whole file. Lines come from FieldPos, so read
	// record by record and stop where ReadAll would.
	var rows [][]string
	var lines []int
	for {
		row, err := r.Read()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.Error = err.Error()
				return res
			}
			break
		}
		line, _ := r.FieldPos(0)
		rows = append(rows, row)
		lines = append(lines, line)
	}
	for i, row := range rows {
		if len(row) == 0 {
			continue
		}
		for j := range row {
			row[j] = strings.Trim(row[j], " ")
		}
		if len(row) != 3 {
			res.Error = fmt.Sprintf("line %d: %d fields %q, expected 3", lines[i], len(row), row)
			return res
		}
		kind, ok := known[row[0]]
		if !ok {
			res.Error = fmt.Sprintf("line %d: could not find DCGM field %q", lines[i], row[0])
			return res
		}
		// The exporter checks the type of DCGM fields only, not of its own DCGM_EXP_* fields.
		if kind != "exporter" && !promTypes[row[1]] {
			res.Error = fmt.Sprintf("line %d: could not find Prometheus metric type %q", lines[i], row[1])
			return res
		}
		res.Records = append(res.Records, record{Line: lines[i], Name: row[0], Type: row[1], Help: row[2]})
	}
	return res
}

func main() {
	fieldsFile := flag.String("fields", "", "gpushare's DCGM field table (gpushare/render/monitoring/dcgm-fields.csv)")
	flag.Parse()
	known, err := readFields(*fieldsFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dcgmcounters:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	status := 0
	for _, path := range flag.Args() {
		res := check(path, known)
		if res.Error != "" {
			status = 1
		}
		if err := out.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "dcgmcounters:", err)
			os.Exit(2)
		}
	}
	os.Exit(status)
}
