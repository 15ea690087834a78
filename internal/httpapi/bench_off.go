//go:build !bench

package httpapi

import "github.com/labstack/echo/v4"

// benchRoutes adds nothing outside benchmark builds.
func (s *Server) benchRoutes(*echo.Group) {}
