module github.com/shardadam/shardadam/bindings/go

go 1.19
