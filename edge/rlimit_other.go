//go:build !unix

package edge

import "errors"

func raiseFileLimit() (FileLimit, error) {
	return FileLimit{}, errors.New("edge: open-file limit: not a Unix system")
}

func fileLimit() (FileLimit, error) {
	return FileLimit{}, errors.New("edge: open-file limit: not a Unix system")
}
