// Command extproc-proxy plays Envoy's part in front of the Gateway API Inference Extension's
// endpoint picker, for the tests and the benchmarks: it is the one stand-in of that path.
//
// For each HTTP request it opens an ext_proc stream to the picker, as Envoy's ext_proc filter
// does in the mode the picker's own Envoy configuration sets (headers SEND, bodies
// FULL_DUPLEX_STREAMED): it sends the request's headers and body, applies the picker's
// header and body mutations, forwards the request to the address the picker named in
// x-gateway-destination-endpoint (the next of a comma-separated list when one cannot be
// reached, as the protocol's fallback says), then sends the answer's headers and body through
// the picker and returns what the picker lets through. An immediate response from the picker
// (an error, a request refused or expired in its queue) is returned as it is.
//
// Usage: extproc-proxy -picker HOST:PORT [-listen ADDR] [-plaintext]
// It prints "listening on ADDR" once it accepts requests.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// destinationHeader is where the picker names the endpoint (pkg/epp/metadata in the picker).
const destinationHeader = "x-gateway-destination-endpoint"

// chunkSize is the most a body message carries, as the picker chunks its own (62,000 bytes).
const chunkSize = 62000

// hopByHop are the headers a proxy does not pass on (RFC 9110, section 7.6.1).
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true,
	"trailer": true, "transfer-encoding": true, "upgrade": true,
}

type proxy struct {
	picker   extprocv3.ExternalProcessorClient
	upstream *http.Client
	maxBody  int64
	timeout  time.Duration
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address to serve HTTP on")
	picker := flag.String("picker", "", "the picker's ext_proc gRPC address, HOST:PORT (its port 9002)")
	plaintext := flag.Bool("plaintext", false, "the picker serves gRPC without TLS (--secure-serving=false)")
	maxBody := flag.Int64("max-body", 16<<20, "the largest request body accepted, in bytes")
	timeout := flag.Duration("timeout", 10*time.Minute, "the longest a request may take, held time included")
	flag.Parse()
	if *picker == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "extproc-proxy: -picker HOST:PORT is required (the picker's ext_proc port), and nothing else")
		flag.Usage()
		os.Exit(2)
	}
	// As the picker's own Envoy configuration does: TLS, its self-signed certificate accepted.
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if *plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(*picker, grpc.WithTransportCredentials(creds))
	if err != nil {
		log.Fatalf("extproc-proxy: cannot use the picker's address %q: %v", *picker, err)
	}
	defer conn.Close()
	p := &proxy{
		picker: extprocv3.NewExternalProcessorClient(conn),
		upstream: &http.Client{Transport: &http.Transport{
			Proxy:               nil, // the engines are reached directly, never through a proxy
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 512,
			IdleConnTimeout:     90 * time.Second,
		}},
		maxBody: *maxBody,
		timeout: *timeout,
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("extproc-proxy: cannot listen on %s: %v", *listen, err)
	}
	fmt.Printf("listening on %s\n", listener.Addr())
	os.Stdout.Sync()
	server := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(server.Serve(listener))
}

// exchange is one request's ext_proc stream.
type exchange struct {
	stream extprocv3.ExternalProcessor_ProcessClient
}

func (e *exchange) send(msg *extprocv3.ProcessingRequest) error {
	if err := e.stream.Send(msg); err != nil {
		return fmt.Errorf("sending to the picker: %w", err)
	}
	return nil
}

func (e *exchange) recv() (*extprocv3.ProcessingResponse, error) {
	msg, err := e.stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("reading the picker's answer: %w", err)
	}
	return msg, nil
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), p.timeout)
	defer cancel()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.maxBody))
	if err != nil {
		http.Error(w, fmt.Sprintf("the request body is over %d bytes (-max-body)", p.maxBody),
			http.StatusRequestEntityTooLarge)
		return
	}
	stream, err := p.picker.Process(ctx)
	if err != nil {
		p.fail(w, r, started, http.StatusBadGateway, fmt.Errorf("the picker cannot be reached: %w", err))
		return
	}
	x := &exchange{stream: stream}
	defer stream.CloseSend()
	headers, newBody, immediate, err := x.request(r, body)
	if err != nil {
		p.fail(w, r, started, http.StatusBadGateway, err)
		return
	}
	if immediate != nil {
		p.immediate(w, r, started, immediate)
		return
	}
	targets := headers.Get(destinationHeader)
	if targets == "" {
		p.fail(w, r, started, http.StatusServiceUnavailable, errors.New("the picker named no endpoint"))
		return
	}
	answer, target, err := p.forward(ctx, r, headers, newBody, targets)
	if err != nil {
		p.fail(w, r, started, http.StatusBadGateway, err)
		return
	}
	defer answer.Body.Close()
	status, err := x.response(w, answer)
	if err != nil {
		log.Printf("%s %s -> %s: the answer was cut: %v", r.Method, r.URL.Path, target, err)
		return
	}
	log.Printf("%s %s -> %s %d in %.3f s", r.Method, r.URL.Path, target, status, time.Since(started).Seconds())
}

// request sends the request's headers and body to the picker and returns the headers and body
// to forward, or the picker's immediate response.
func (x *exchange) request(r *http.Request, body []byte) (http.Header, []byte, *extprocv3.ImmediateResponse, error) {
	headers := r.Header.Clone()
	for name := range headers {
		if hopByHop[strings.ToLower(name)] {
			headers.Del(name)
		}
	}
	if headers.Get("x-request-id") == "" {
		// Envoy gives every request an id; the picker keys its per-request state by it.
		headers.Set("x-request-id", requestID())
	}
	if len(body) > 0 {
		headers.Set("content-length", strconv.Itoa(len(body)))
	}
	pseudo := [][2]string{
		{":method", r.Method}, {":path", r.URL.RequestURI()}, {":authority", r.Host}, {":scheme", "http"},
	}
	noBody := len(body) == 0
	err := x.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(pseudo, headers), EndOfStream: noBody,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	for start := 0; start < len(body); start += chunkSize {
		end := min(start+chunkSize, len(body))
		err := x.send(&extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body: body[start:end], EndOfStream: end == len(body),
			}},
		})
		if err != nil {
			return nil, nil, nil, err
		}
	}
	// The headers' answer comes first; the body's, chunk by chunk, until one ends the stream.
	var newBody bytes.Buffer
	gotHeaders, bodyDone := false, noBody
	for !gotHeaders || !bodyDone {
		msg, err := x.recv()
		if err != nil {
			return nil, nil, nil, err
		}
		switch answer := msg.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			return nil, nil, answer.ImmediateResponse, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			mutate(headers, answer.RequestHeaders.GetResponse().GetHeaderMutation())
			gotHeaders = true
		case *extprocv3.ProcessingResponse_RequestBody:
			streamed := answer.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if streamed == nil {
				return nil, nil, nil, errors.New("the picker answered the body without a streamed body")
			}
			newBody.Write(streamed.Body)
			bodyDone = streamed.EndOfStream
		default:
			return nil, nil, nil, fmt.Errorf("the picker answered the request with %T", answer)
		}
	}
	if noBody {
		return headers, body, nil, nil
	}
	return headers, newBody.Bytes(), nil, nil
}

// forward sends the request to the first of `targets` that takes a connection.
func (p *proxy) forward(ctx context.Context, r *http.Request, headers http.Header, body []byte,
	targets string) (*http.Response, string, error) {
	var errs []error
	for _, target := range strings.Split(targets, ",") {
		target = strings.TrimSpace(target)
		if _, _, err := net.SplitHostPort(target); err != nil {
			errs = append(errs, fmt.Errorf("the picker named %q, which is not HOST:PORT", target))
			continue
		}
		out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+target+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			return nil, target, err
		}
		for name, values := range headers {
			if strings.HasPrefix(name, ":") || strings.EqualFold(name, "content-length") {
				continue
			}
			out.Header[name] = values
		}
		out.Host = r.Host
		answer, err := p.upstream.Do(out)
		if err == nil {
			return answer, target, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", target, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, targets, fmt.Errorf("no endpoint the picker named answered: %w", errors.Join(errs...))
}

// response sends the answer's headers and body through the picker, and writes to the client
// what the picker lets through. It returns the status written.
func (x *exchange) response(w http.ResponseWriter, answer *http.Response) (int, error) {
	headers := answer.Header.Clone()
	for name := range headers {
		if hopByHop[strings.ToLower(name)] {
			headers.Del(name)
		}
	}
	status := strconv.Itoa(answer.StatusCode)
	err := x.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap([][2]string{{":status", status}}, headers),
		}},
	})
	if err != nil {
		return 0, err
	}
	// The body goes to the picker as it comes, while its answers come back: full duplex.
	sent := make(chan error, 1)
	go func() {
		sent <- x.streamBody(answer.Body)
	}()
	flusher, _ := w.(http.Flusher)
	wrote := false
	for {
		msg, err := x.recv()
		if err != nil {
			return 0, err
		}
		switch reply := msg.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			if wrote {
				return 0, errors.New("the picker answered with an immediate response after the headers")
			}
			writeImmediate(w, reply.ImmediateResponse)
			return int(reply.ImmediateResponse.GetStatus().GetCode()), nil
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			mutate(headers, reply.ResponseHeaders.GetResponse().GetHeaderMutation())
			for name, values := range headers {
				if !strings.HasPrefix(name, ":") && !strings.EqualFold(name, "content-length") {
					w.Header()[name] = values
				}
			}
			w.WriteHeader(answer.StatusCode)
			wrote = true
		case *extprocv3.ProcessingResponse_ResponseBody:
			streamed := reply.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if streamed == nil {
				return 0, errors.New("the picker answered the response body without a streamed body")
			}
			if !wrote {
				return 0, errors.New("the picker answered the response body before its headers")
			}
			if _, err := w.Write(streamed.Body); err != nil {
				return 0, err
			}
			if flusher != nil {
				flusher.Flush()
			}
			if streamed.EndOfStream {
				return answer.StatusCode, <-sent
			}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			// The picker answers trailers only on gRPC; HTTP/1.1 answers carry none.
		default:
			return 0, fmt.Errorf("the picker answered the response with %T", reply)
		}
	}
}

// streamBody sends the engine's answer to the picker in chunks, the last one ending the stream.
func (x *exchange) streamBody(body io.Reader) error {
	buffer := make([]byte, chunkSize)
	for {
		n, err := body.Read(buffer)
		end := errors.Is(err, io.EOF)
		if err != nil && !end {
			return fmt.Errorf("reading the engine's answer: %w", err)
		}
		if n > 0 || end {
			chunk := append([]byte(nil), buffer[:n]...)
			sendErr := x.send(&extprocv3.ProcessingRequest{
				Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
					Body: chunk, EndOfStream: end,
				}},
			})
			if sendErr != nil {
				return sendErr
			}
		}
		if end {
			return nil
		}
	}
}

func (p *proxy) immediate(w http.ResponseWriter, r *http.Request, started time.Time, answer *extprocv3.ImmediateResponse) {
	writeImmediate(w, answer)
	log.Printf("%s %s: the picker answered %d (%s) in %.3f s", r.Method, r.URL.Path,
		answer.GetStatus().GetCode(), answer.GetDetails(), time.Since(started).Seconds())
}

func writeImmediate(w http.ResponseWriter, answer *extprocv3.ImmediateResponse) {
	headers := http.Header{}
	mutate(headers, answer.GetHeaders())
	for name, values := range headers {
		w.Header()[name] = values
	}
	code := int(answer.GetStatus().GetCode())
	if code < 200 || code > 599 {
		code = http.StatusInternalServerError
	}
	w.WriteHeader(code)
	w.Write(answer.GetBody())
}

func (p *proxy) fail(w http.ResponseWriter, r *http.Request, started time.Time, code int, err error) {
	http.Error(w, "extproc-proxy: "+err.Error(), code)
	log.Printf("%s %s: %d in %.3f s: %v", r.Method, r.URL.Path, code, time.Since(started).Seconds(), err)
}

// headerMap is Envoy's view of a message's headers: the pseudo-headers, then the others in
// lower case, each value as raw bytes.
func headerMap(pseudo [][2]string, headers http.Header) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for _, kv := range pseudo {
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	for name, values := range headers {
		for _, value := range values {
			out.Headers = append(out.Headers, &corev3.HeaderValue{Key: strings.ToLower(name), RawValue: []byte(value)})
		}
	}
	return out
}

// mutate applies a header mutation: each set header replaces the value it had, as the
// picker's mutations mean (it sets the destination and the content length once).
func mutate(headers http.Header, mutation *extprocv3.HeaderMutation) {
	for _, name := range mutation.GetRemoveHeaders() {
		headers.Del(name)
	}
	for _, option := range mutation.GetSetHeaders() {
		header := option.GetHeader()
		value := string(header.GetRawValue())
		if value == "" {
			value = header.GetValue()
		}
		if strings.HasPrefix(header.GetKey(), ":") {
			continue
		}
		headers.Set(header.GetKey(), value)
	}
}

func requestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
