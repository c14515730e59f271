package fasthttpmw_test

import (
	"net"
	"strings"

	"github.com/valyala/fasthttp"
)

// addr is a TCP peer address for fasthttp.RequestCtx.Init.
func addr(s string) net.Addr {
	a, err := net.ResolveTCPAddr("tcp", s)
	if err != nil {
		panic(err)
	}
	return a
}

// header is the response's field called name, in any case (the wrapper
// writes the quota fields under their exact names).
func header(ctx *fasthttp.RequestCtx, name string) string {
	for k, v := range ctx.Response.Header.All() {
		if strings.EqualFold(string(k), name) {
			return string(v)
		}
	}
	return ""
}
