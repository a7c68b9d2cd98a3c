package propolisapi

import (
	"log/slog"
	"net/http"
	"time"
)

// NewHandlerReadTimeout is NewHandler with every body read deadline d.
func NewHandlerReadTimeout(b Backend, log *slog.Logger, d time.Duration) http.Handler {
	return newHandler(b, log, d)
}
