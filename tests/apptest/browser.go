package apptest

import (
	"context"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// Browser starts the system Chromium headless with a fresh profile,
// installing Debian's package first when it is missing.
func Browser(ctx context.Context, t testing.TB, width, height int) context.Context {
	t.Helper()
	path := chromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.WindowSize(width, height),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("Chromium (%s) did not start: %v", path, err)
	}
	return browser
}

// chromium is the system Chromium, installed with apt-get when missing.
func chromium(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Log("chromium is missing: installing Debian's package")
	out, err := exec.Command("sh", "-c", "apt-get update && apt-get install -y chromium").CombinedOutput()
	if err != nil {
		t.Fatalf("install chromium: %v\n%s", err, out)
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is still missing after apt-get: %v", err)
	}
	return p
}
