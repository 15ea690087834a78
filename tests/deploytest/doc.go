// Package deploytest holds no code, only tests: they load the Dockerfile and
// docker-compose.yml at the repository root, check them against the code
// (the variables the service reads, the commands that exist), and run the
// binaries the image contains with the compose file's configuration.
package deploytest
