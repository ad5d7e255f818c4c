module github.com/linnet/linnet/clients/go/linnet

go 1.19
