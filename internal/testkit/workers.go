package testkit

import "sync"

// Workers runs f(w, i) for i = 0, 1, 2, ... on n goroutines (w = 0 … n-1)
// until stop is closed, and returns a function that waits for them. Each
// call of f must itself be bounded in time.
func Workers(n int, stop <-chan struct{}, f func(w, i int)) (wait func()) {
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f(w, i)
			}
		}()
	}
	return wg.Wait
}
