// A measurement probe, not part of the product: the tap's relay written natively (Go, standard
// library only), to measure whether a relay without a Python call per read brings the tap's
// added latency to HAProxy's (bench/results/tap-vs-haproxy.md, "A native relay, measured").
//
// Every byte is passed on as it arrives, both ways, one goroutine per direction; after each
// write, a copy of what was read goes (non-blocking: dropped and counted when the queue is
// full) to a writer that frames it onto the stdin of a consumer process, started here at
// niceness 10 as the tap's classifier is: `consumer.py`, which parses the copies with the
// tap's own ConnectionObserver and classifies each tool-calling exchange. With NOCOPY=1 set
// nothing is copied: the relay alone.
//
//	(cd bench/probes/native_relay && go build -o /tmp/native-relay .)
//	python bench/tap.py --reference-proxy /usr/sbin/haproxy --tap-command '/tmp/native-relay
//	    -listen {listen} -upstream {upstream} -metrics {metrics} -python {python}
//	    -consumer bench/probes/native_relay/consumer.py'
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync/atomic"
)

// The kinds of a framed record: request bytes, response bytes, the connection closed.
const (
	requestBytes  = 0
	responseBytes = 1
	closed        = 2
)

type record struct {
	conn uint32
	kind byte
	data []byte
}

var (
	copies  = make(chan record, 8192)
	dropped atomic.Int64
	noCopy  = os.Getenv("NOCOPY") != ""
)

func submit(r record) {
	select {
	case copies <- r:
	default:
		dropped.Add(1)
	}
}

// pump relays src to dst until either ends, copying each read after it has been written.
func pump(dst, src net.Conn, conn uint32, kind byte, done chan<- struct{}) {
	defer close(done)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if !noCopy {
				submit(record{conn, kind, append([]byte(nil), buf[:n]...)})
			}
		}
		if err != nil {
			return
		}
	}
}

func relay(client net.Conn, upstream string, id uint32) {
	defer client.Close()
	router, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer router.Close()
	requests, responses := make(chan struct{}), make(chan struct{})
	go pump(router, client, id, requestBytes, requests)
	go pump(client, router, id, responseBytes, responses)
	select {
	case <-requests: // the client half-closed: the response may still come
		router.(*net.TCPConn).CloseWrite()
		<-responses
	case <-responses:
	}
	if !noCopy {
		submit(record{id, closed, nil})
	}
}

// frame writes each record as (connection u32, kind u8, length u32, bytes), little-endian,
// flushing whenever the queue is empty.
func frame(w io.Writer) {
	out := bufio.NewWriterSize(w, 64<<10)
	var head [9]byte
	for r := range copies {
		binary.LittleEndian.PutUint32(head[0:], r.conn)
		head[4] = r.kind
		binary.LittleEndian.PutUint32(head[5:], uint32(len(r.data)))
		if _, err := out.Write(head[:]); err != nil {
			log.Fatal(err)
		}
		out.Write(r.data)
		if len(copies) == 0 {
			out.Flush()
		}
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "host:port to accept on")
	upstream := flag.String("upstream", "127.0.0.1:8000", "host:port to relay to")
	metrics := flag.String("metrics", "127.0.0.1:9090", "host:port of /metrics (drops only)")
	consumer := flag.String("consumer", "consumer.py", "the copies' reader (python)")
	python := flag.String("python", "python3", "the interpreter for -consumer")
	flag.Parse()
	if !noCopy {
		cmd := exec.Command("nice", "-n", "10", *python, *consumer)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			log.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			log.Fatal(err)
		}
		go frame(stdin)
	}
	go func() {
		log.Fatal(http.ListenAndServe(*metrics, http.HandlerFunc(
			func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "dsv4_tap_classifier_dropped_total %d\n", dropped.Load())
			})))
	}()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	var id uint32
	for {
		client, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		id++
		go relay(client, *upstream, id)
	}
}
